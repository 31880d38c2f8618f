"""A user's multi-token task for rlexp, kept outside the rlexp package (see ../README.md)."""
