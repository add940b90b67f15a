"""The local node: a kubelet, scheduler and kube-proxy for one machine, running pods as processes in
bubblewrap sandboxes (DESIGN §4)."""
