"""Privacy accounting for user-level DP-FedAvg (McMahan et al. 2018): the epsilon a run has
spent, the noise a privacy budget needs (``accountant``) and ``fedray privacy``
(``commands``)."""
