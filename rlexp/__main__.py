import sys

from rlexp.cli import main

sys.exit(main())
