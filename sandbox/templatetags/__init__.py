"""Template tags of the sandbox."""
