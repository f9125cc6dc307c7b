from modelserve.cli import run

run()
