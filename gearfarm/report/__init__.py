"""What people get from a night: the run's report document, publishing it (disk, S3, one mail),
links to job logs, and downloading a build (`gearfarm artifact get`)."""
