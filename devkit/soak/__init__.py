"""`make soak` (`python -m devkit.soak`): a long mixed workload through one proxy process in front
of a real Tansu, sampled every few seconds, then judged: resident memory flat after warm-up, no
file-descriptor growth, no errors in the proxy's log, every acknowledged record consumed.

.workload holds the clients, .quota_admin the AlterClientQuotas connection, .samples what is read
from the proxy every few seconds (and the CSV and the plot), .verdict the judgement, .run the
order of it all. docs/reliability.md ("Soak") has a full run's figures."""
