"""The forecast: the recipe's own curve continued, and a loss law fitted on a sweep's curves,
predict the recipe's and the envelopes' losses at longer horizons, before any of them is
trained (`schedule-search forecast`). Ray-free: it reads the records alone."""

from schedule_search.forecast.law import Curve, LossLaw, Run, fit_law
from schedule_search.forecast.predict import Forecast, forecast_sweep
from schedule_search.forecast.write import write_forecast

__all__ = ["Curve", "Forecast", "LossLaw", "Run", "fit_law", "forecast_sweep", "write_forecast"]
