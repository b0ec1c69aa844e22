"""The board runtime: bundle loading, backends, generation. Needs no torch and no transformers."""
