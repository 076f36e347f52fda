"""What every app of the coordinator needs and no app owns: the error hierarchy and its
one handler, who is acting, the permission policy, long random secrets and the shared API
pieces. It imports no app, so every app can import it: the arrows point down only
(accounts, hospitals, training, audit and monitoring above it; the project, in
``coordinator/``, above them all)."""
