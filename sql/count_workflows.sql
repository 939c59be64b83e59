SELECT count(*) FROM workflows;
