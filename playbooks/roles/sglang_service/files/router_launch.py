#!/usr/bin/env python3
"""Start sglang-router with its API key taken from the environment, not from the command line.

Usage (the router unit's ExecStart): VENV_PYTHON dsv4-router-launch ROUTER_ARGS...

sglang-router 0.3.2 takes its key only as ``--api-key KEY``, and a command line is readable by
every local user in /proc/PID/cmdline. This parses ``ROUTER_ARGS`` plus the key from
``$DSV4_ROUTER_API_KEY`` (the unit's root-only EnvironmentFile) with the router's own parser and
starts it in this process, so the key never appears in an argv.
"""
import os
import sys


def main() -> None:
    from sglang_router.launch_router import launch_router, parse_router_args

    argv = sys.argv[1:]
    if any(arg == "--api-key" or arg.startswith("--api-key=") for arg in argv):
        sys.exit("dsv4-router-launch: the API key comes from $DSV4_ROUTER_API_KEY, not from --api-key")
    key = os.environ.pop("DSV4_ROUTER_API_KEY", "")
    launch_router(parse_router_args(argv + (["--api-key", key] if key else [])))


if __name__ == "__main__":
    main()
