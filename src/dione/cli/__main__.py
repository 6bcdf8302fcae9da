"""``python -m dione.cli``: the ``dione`` command."""

import sys

from dione.cli import main

sys.exit(main())
