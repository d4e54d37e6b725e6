import sys

from trainctl.cli.main import main

sys.exit(main())
