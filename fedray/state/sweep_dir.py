"""A sweep's directory: its files and a trial's statuses. The sweep (fedray.cluster.sweep)
writes them and the report (fedray.tracking.report) reads them; both import the layout from
here, so neither needs the other.
"""

SWEEP_FILE = "sweep.yaml"
TUNE_DIR = "tune"
TRIALS_DIR = "trials"
RESULTS_FILE = "results.csv"
PLAN_FILE = "trials.json"  # the planned trials and each one's status (fedray's own record)
SUMMARY_FILE = "summary.json"  # what a fedray run writes when it has run all its rounds
# a trial's status (results.csv, trials.json); only FINISHED trials are averaged in report/
FINISHED, STOPPED, INTERRUPTED, NOT_STARTED, RUNNING = (
    "finished", "stopped early", "interrupted", "not started", "running")
ERROR = "error: "  # followed by the error's last line
REPORT_DIR = "report"
