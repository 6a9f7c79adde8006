"""The demo `harel-beanie demo` runs: the shop models (`shop_models/`), the workload mixed
from them (`mix`), the run itself (`run`) and what it prints (`report`).
"""
