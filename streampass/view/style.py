"""Caps and colours every drawing shares."""

from __future__ import annotations

MAX_NODES = 250
"""Default cap on the nodes one drawing shows (a bigger graph gets a region and a note)."""

MAX_HAZARD_EDGES = 60
"""Hazard edges without a data edge under them drawn per picture (the nodes stay red)."""
MAX_LABELLED_HAZARDS = 40
DOT_TIMEOUT_S = 30.0
JSON_FORMAT = "streampass.dag/1"

# colours: lane fills per stream (0 = ambient, grey), edge kinds, hazards
LANE_FILLS = [
    "#f3f3f3",
    "#e8f1fb",
    "#eaf6ea",
    "#fbf0e4",
    "#f3eafa",
    "#e6f5f5",
    "#fbeaf0",
    "#f5f5e0",
]
LANE_EDGES = [
    "#9a9a9a",
    "#5b8fd0",
    "#5aa55a",
    "#d08a3c",
    "#9a6fc4",
    "#3fa0a0",
    "#c9607f",
    "#a0a040",
]
DATA_COLOUR = "#555555"
CROSS_COLOUR = "#1f6fd0"
SYNC_COLOUR = "#8a3ab9"
HAZARD_COLOUR = "#d62728"
HAZARD_FILL = "#fde0e0"
RECORD_FILL = "#dff3df"
WAIT_FILL = "#ffe9c7"
