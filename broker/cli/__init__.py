def main() -> None:
    print("spotbroker")
