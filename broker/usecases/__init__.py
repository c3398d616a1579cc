"""What a request asks of the broker about jobs, as plain functions taking a
session: above the kernel (broker/jobs/) and every room a job passes through."""
