"""`status`: one diagnosis joining a log scan (who died, of what) with a GPU snapshot (what it left behind)."""
