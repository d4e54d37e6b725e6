"""The run report (`trainctl report`): collect (the run directory read without disturbing
its agent), svg (inline charts), render (HTML and Markdown)."""
