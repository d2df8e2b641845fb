def main() -> None:
    raise SystemExit("pdx-router: not built yet")
