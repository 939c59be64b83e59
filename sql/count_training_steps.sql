SELECT count(*) FROM training_steps;
