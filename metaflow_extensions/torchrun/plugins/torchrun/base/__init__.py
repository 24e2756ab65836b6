"""The bottom layer: what every other layer may import and which imports nothing of
them (defaults, fixed times, the settings' names and record, the wire codec, text
helpers, the lazy face loader, the version). Empty: each is imported by its path."""
