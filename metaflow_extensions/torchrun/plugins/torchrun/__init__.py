"""The @torchrun implementation; see DESIGN.md for how the modules fit."""
