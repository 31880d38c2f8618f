"""Verifiers: label-free scorers of (problem, response) that `single_rm` and `weaver` combine.

The interface is in `base`; building one from config is in `registry`. Nothing is re-exported here, so
importing one implementation does not import the others."""
