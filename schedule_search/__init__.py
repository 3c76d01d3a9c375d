"""schedule-search: tune horizon-free LR schedules, weight averaging and time windows once,
prove them on longer horizons, and export the recipe for your own training loop."""

__version__ = "0.1.0"
