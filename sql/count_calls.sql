SELECT count(*) FROM calls;
