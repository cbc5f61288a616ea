"""One kernel item's run (`items.py` collects it, `item_runner.py` runs it), and the session
that hosts it (`session.py`); each module's docstring says its job.

Other plugins (the optimizer) work on a measured item through the
`pytest_kernelpro_item_measured` hook; nothing here imports them. `plugin.py` (hooks only) is
this package's one caller from pytest.
"""
