"""A choice grammar (one of a list of strings) as the EBNF xgrammar compiles: read where a request is
checked and where the compile worker compiles it."""

import json


def choice_ebnf(source: str) -> str:
    """The EBNF of a choice list (ValueError if it is not a non-empty list of non-empty strings)."""
    try:
        options = json.loads(source)
    except ValueError:
        options = None
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
        raise ValueError("a choice grammar needs a non-empty list of non-empty strings")
    return "root ::= " + " | ".join(json.dumps(o) for o in options)
