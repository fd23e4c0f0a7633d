"""Remote validation over SSH: ``dsv4kit validate --gpu N``. (Not implemented yet.)"""

from dsv4kit import exitcodes


def run(**kwargs) -> int:
    import sys

    print("error: remote validation is not implemented yet", file=sys.stderr)
    return exitcodes.USAGE
