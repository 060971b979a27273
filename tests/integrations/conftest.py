import sys
from pathlib import Path

# cpu_groups.py (the CPU worker groups) lives next to the tests that use it.
sys.path.insert(0, str(Path(__file__).parent))
