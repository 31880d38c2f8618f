from rlexp.cli import run

run()
