"""One kernel item's run, and the session that hosts it. Other plugins (the optimizer) work
on a measured item through the `pytest_kernelpro_item_measured` hook; nothing here imports
them.
"""
