import sys

from hvdscale.native import main

sys.exit(main())
