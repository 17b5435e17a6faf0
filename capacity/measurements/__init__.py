"""What real benchmark runs wrote: schemas, readers, benchmark-client rules, a measured row as a scenario."""
