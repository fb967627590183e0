"""Tables, plots and HTML reports built from stored records."""
