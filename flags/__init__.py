"""absl flag definitions, grouped by concern; they import only absl, the standard library and each
other. run, search and sweep hold the user's flags (--helpshort), advanced the rest."""
