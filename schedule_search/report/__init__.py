"""What a user reads: the sweep report (markdown, plots, Optuna views, TensorBoard files),
the transfer table and plots, and the figure writer they share."""
