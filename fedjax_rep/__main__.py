import sys

from fedjax_rep.cli import main

sys.exit(main())
