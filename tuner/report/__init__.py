"""Reports: a study's CSV, importances, tables and plots (`report`, `tables`, `plots`), and
`tuner bench`'s side-by-side timings against torch (`bench`)."""
