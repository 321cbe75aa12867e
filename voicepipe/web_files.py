"""Where the browser client's files are, in a checkout and in an installed wheel alike.

The client lives in the repository's top-level `web/`, which pyproject.toml maps onto the package
`voicepipe.web`: a wheel ships it inside voicepipe, and an editable install points at the checkout.
"""

from importlib.resources import files
from pathlib import Path

WEB_DIR: Path = Path(str(files("voicepipe.web")))
