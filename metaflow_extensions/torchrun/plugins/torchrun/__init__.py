"""The @torchrun implementation; docs/design.md (in the project) says how the modules fit."""
