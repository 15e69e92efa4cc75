"""``python -m ha_controller.cli ...`` is ``hactl ...`` (the test helpers start it so)."""

from ha_controller.cli import main

main()
