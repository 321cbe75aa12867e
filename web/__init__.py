"""The browser client: shipped inside the voicepipe wheel as the package `voicepipe.web` (pyproject.toml maps
this directory onto it), found through `voicepipe.web_files.WEB_DIR`. A regular package, not a namespace
one, because setuptools' editable installs cannot find a namespace package mapped to another directory."""
