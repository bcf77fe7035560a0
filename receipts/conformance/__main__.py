"""``python -m receipts.conformance REQUEST_JSON``: one step of the kit in a child process."""

import json
import sys

from receipts.conformance.child import child_main

if __name__ == "__main__":  # imported (every module is, by the packaging test), it does nothing
    sys.exit(child_main(json.loads(sys.argv[1])))
