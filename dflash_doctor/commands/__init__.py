"""One module per subcommand. Each defines `register(app)` and imports its domain package lazily."""
