"""Development tools that are not part of the zerobench package: the headless browser the HTML
report's tests and screenshots use. Run from the repository root (`python -m tools.screenshot`)."""
