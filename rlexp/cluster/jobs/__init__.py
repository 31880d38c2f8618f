"""The built-in job kinds, one module each (`rlexp.cluster.registry.register_job`)."""
