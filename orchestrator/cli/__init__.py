"""The `dsorch` command: click commands by family, what they print, the experiment repository's defaults."""
