"""``StragglerDetector``: the rank that slows every step named, with the part of its step that is slow."""
