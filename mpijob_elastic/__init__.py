"""mpijob-elastic: a controller that makes kubeflow.org/v1 MPIJobs elastic."""
