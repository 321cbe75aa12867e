"""Turn-taking: the detection modes, the endpointer and its stage, the end-of-turn judgement, barge-in and
backchannels, and the TurnTaking stage that says when the assistant answers."""
