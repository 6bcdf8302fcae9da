"""``python -m dione``: the ``dione`` command (as ``python -m dione.cli``)."""

import sys

from dione.cli import main

sys.exit(main())
