from verinfer.cli import app

app()
