try:
    from kitdispatch.cli import console_main
except KeyboardInterrupt:  # the package itself says so when it was importing (__init__.py)
    import sys

    print("kitdispatch: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

console_main()
