"""A user's task for rlexp, kept outside the rlexp package (see ../README.md)."""
