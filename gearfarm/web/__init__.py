"""The dashboard: the Flask app and its routes (app), the data each page shows (dashboard), self-
service runs, and SVG charts."""
